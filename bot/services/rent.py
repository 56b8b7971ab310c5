"""`/gpu rent`: rent through a provider's API, wait until the instance runs and its SSH port
answers, then register it like `/gpu register` (host key pinned, agent installed, health checked,
meter and deadline started).

Everything that can be checked is checked before anything is rented (provider, type, names,
price, budget). An instance that was launched but could not be registered is terminated again,
so nothing is left billing unseen; every launch is in the audit log. ``recover_orphans`` (run by
the tick) covers the bot stopping part-way:

- between launching and registering: the launch's answer is in the audit log, so it terminates
  the instances that were never registered and tells the person who rented them;
- during the launch call itself (or when the call ended without an answer, as on a timeout): the
  intent was written before the call, with a launch id that is part of the name the instances
  get on the platform. Once the call cannot still be running, it looks the name up in the
  platform's list, terminates what it finds and tells the renter what happened either way.

What is said to the renter is said in their language (bot.services.people.language_for).
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import select

from bot.errors import Conflict, GpubotError, ProviderError, UsageError
from bot.i18n import N_, speaking, t
from bot.notify import Notice
from bot.providers.base import LaunchRequest, Provider, ProviderInstance, no_launch
from bot.runtime import Runtime
from bot.services import audit, budgets, outbox, prompts, registration
from bot.services.access import Caller
from bot.services.people import language_for
from bot.services.registration import RegisterRequest
from bot.services.views import RegisterResult
from bot.store.models import AuditLog, Instance

log = logging.getLogger(__name__)

#: How long to wait for the platform to report an instance running with an address.
WAIT_RUNNING_S = 900.0
#: How long to wait for its SSH port to accept connections after that.
WAIT_SSH_S = 300.0
POLL_S = 5.0
MAX_COUNT = 8
#: Time to register one instance once SSH answers (host key, agent upload, health check).
REGISTER_S = 300.0
#: How far back ``recover_orphans`` looks for launches.
ORPHAN_LOOKBACK = timedelta(days=7)
#: After this, a launch call without a recorded answer has ended (HTTP timeouts are far shorter).
LAUNCH_CALL = timedelta(minutes=10)
#: Why a launched instance was never registered, for its renter.
STOPPED_WHILE_SETTING_UP = N_("the bot stopped while setting it up")
ANSWER_NEVER_CAME = N_("the platform's answer to the launch never reached the bot")

#: (provider, provider id) of launches this process is still adopting.
_adopting: set[tuple[str, str]] = set()
#: Launch ids whose launch call is still running in this process.
_launching: set[str] = set()
_adopting_lock = threading.Lock()


@dataclass(frozen=True)
class RentRequest:
    """What `/gpu rent` asks for. ``name`` defaults to the provider and type; with ``count`` > 1
    the instances are NAME-1, NAME-2 ... ``price_micros_per_hour`` overrides the published one."""

    provider: str
    instance_type: str
    count: int = 1
    name: str | None = None
    price_micros_per_hour: int | None = None
    release_in: timedelta | None = None
    release_at: datetime | None = None
    image: str | None = None
    ssh_key_name: str | None = None
    region: str | None = None
    ssh_user: str = "root"
    key_name: str | None = None
    project: str | None = None
    python_path: str | None = None
    disk_gb: int | None = None
    agent_home: str | None = None


@dataclass(frozen=True)
class RentPlan:
    """A checked request: the provider, the names, the price per instance-hour (None: read
    from each launched instance) and the GPUs of the type where the platform says."""

    request: RentRequest
    provider: Provider
    names: tuple[str, ...]
    price_micros_per_hour: int | None
    gpu_model: str | None
    gpu_count: int | None


@dataclass(frozen=True)
class RentResult:
    """Registered instances, and (provider id, what went wrong) for those that were not (they
    were terminated again)."""

    registered: tuple[RegisterResult, ...]
    failed: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RentStarted(Notice):
    """`/gpu rent` checked and under way: ``names`` of ``instance_type`` on ``provider``."""

    provider: str
    instance_type: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class RentFinished(Notice):
    """What a rental by ``owner_id`` came to: the names registered, and (provider id, what went
    wrong) of those that were not (they were terminated again)."""

    provider: str
    registered: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    owner_id: str


@dataclass(frozen=True)
class RentFailed(Notice):
    """Renting on ``provider`` failed with ``error`` (None: an unexpected failure, in the log)."""

    provider: str
    error: str | None


@dataclass(frozen=True)
class RentGivenBackFailed(Notice):
    """To the renter: a rented instance could not be registered (``why``) and terminating it
    failed too (``error``): it bills until someone terminates it."""

    provider: str
    provider_id: str
    why: str
    error: str


@dataclass(frozen=True)
class RentRecovered(Notice):
    """To the renter: an instance rented at ``launched_at`` (naive UTC, shown in ``tz_name``;
    ``name`` where it got one) was never registered because of ``reason``, and has been
    terminated."""

    provider: str
    provider_id: str
    name: str | None
    launched_at: datetime
    reason: str
    tz_name: str = "UTC"


@dataclass(frozen=True)
class RentRecoverFailed(Notice):
    """To the renter: an instance never registered (``reason``) could not be terminated
    (``error``); the bot keeps trying."""

    provider: str
    provider_id: str
    name: str | None
    reason: str
    error: str


@dataclass(frozen=True)
class RentLaunchChecked(Notice):
    """To the renter: a launch of ``instance_type`` at ``started_at`` (naive UTC, shown in
    ``tz_name``) got no answer, and nothing was found started under its ``platform_name``."""

    provider: str
    instance_type: str
    started_at: datetime
    platform_name: str
    tz_name: str = "UTC"


@dataclass(frozen=True)
class Waiting:
    """The clock and pauses the waits use (tests pass their own)."""

    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    running_s: float = WAIT_RUNNING_S
    ssh_s: float = WAIT_SSH_S
    poll_s: float = POLL_S


def plan_rent(rt: Runtime, caller: Caller, req: RentRequest) -> RentPlan:
    """Check a request without renting anything. Raises UsageError, Conflict (a name in use),
    BudgetExceeded, ConfigError/NotFound (provider), ProviderError (cannot rent, unknown type)."""
    if not 1 <= req.count <= MAX_COUNT:
        raise UsageError(
            t("Rent 1 to {most} instances at a time.", most=MAX_COUNT), hint=t("Use --count 1.")
        )
    provider = rt.providers.get(req.provider)
    if not provider.capabilities.can_launch:
        raise no_launch(provider.name)
    names = _names(req)
    _check_free(rt, names)
    gpu_model, gpu_count, listed_price = _type_facts(provider, req.instance_type)
    price = req.price_micros_per_hour if req.price_micros_per_hour is not None else listed_price
    if price is None and not provider.capabilities.reports_instance_price:
        raise UsageError(
            t(
                "{provider} publishes no price the bot can read for {type}.",
                provider=provider.name,
                type=req.instance_type,
            ),
            hint=t("Add the price you pay, like --price 1.01/h."),
        )
    budgets.check_budget(rt, caller, caller.user_id, req.project)
    return RentPlan(req, provider, names, price, gpu_model, gpu_count)


def rent(
    rt: Runtime, caller: Caller, plan: RentPlan, *, waiting: Waiting | None = None
) -> RentResult:
    """Launch, wait for each instance and register it. Raises ProviderError when the launch
    itself fails: nothing was rented when the platform refused; after other errors (a timeout)
    ``recover_orphans`` later looks for what the platform may have started anyway."""
    waiting = waiting or Waiting()
    req = plan.request
    launch_id = secrets.token_hex(4)
    platform_name = f"{_base_name(req) if req.count > 1 else plan.names[0]}-{launch_id}"
    _audit(
        rt,
        caller,
        "rent_launching",
        provider=plan.provider.name,
        launch_id=launch_id,
        platform_name=platform_name,
        names=list(plan.names),
        instance_type=req.instance_type,
    )
    launched = _launch(rt, caller, plan, launch_id, platform_name)
    keys = {(plan.provider.name, i.provider_id) for i in launched}
    try:
        _audit(
            rt,
            caller,
            "rent_launched",
            provider=plan.provider.name,
            launch_id=launch_id,
            ids=[i.provider_id for i in launched],
            names=list(plan.names[: len(launched)]),
            instance_type=req.instance_type,
        )
        registered: list[RegisterResult] = []
        failed: list[tuple[str, str]] = []
        for name, inst in zip(plan.names, launched, strict=False):
            try:
                registered.append(_adopt(rt, caller, plan, name, inst, waiting))
            except GpubotError as exc:
                log.warning(
                    "rented %s (%s) could not be registered: %s", name, inst.provider_id, exc
                )
                failed.append((inst.provider_id, exc.user_text()))
                _give_back(rt, caller, plan.provider, inst.provider_id, exc)
        return RentResult(tuple(registered), tuple(failed))
    finally:
        with _adopting_lock:
            _adopting.difference_update(keys)


def rent_and_report(rt: Runtime, caller: Caller, plan: RentPlan) -> RentResult | None:
    """:func:`rent`, then tell the caller's channel (or the caller) what came of it, once
    (:class:`RentFinished` or :class:`RentFailed`, in the caller's language: it answers their
    command); for the executor after `/gpu rent` has answered. Returns the result, None when
    renting failed (nothing is raised)."""
    with speaking(language_for(rt, caller.user_id)):
        return _rent_and_report(rt, caller, plan)


def _rent_and_report(rt: Runtime, caller: Caller, plan: RentPlan) -> RentResult | None:
    where = caller.channel_id or caller.user_id
    key = f"rent:{caller.user_id}:{uuid.uuid4().hex}"  # this rent's outcome is said once
    try:
        result = rent(rt, caller, plan)
    except GpubotError as exc:
        _notify(rt, where, RentFailed(plan.provider.name, exc.user_text()), key=key)
        return None
    except Exception:  # a background task has nobody else to tell
        log.exception("renting on %s failed", plan.provider.name)
        _notify(rt, where, RentFailed(plan.provider.name, None), key=key)
        return None
    finished = RentFinished(
        plan.provider.name,
        tuple(r.instance.name for r in result.registered),
        result.failed,
        caller.user_id,
    )
    _notify(rt, where, finished, key=key)
    return result


def recover_orphans(rt: Runtime, now: datetime) -> list[str]:
    """Terminate instances `/gpu rent` launched but never registered nor gave back (the bot
    stopped in between), and tell whoever rented them. A launch counts as orphaned once this
    process is not adopting it and the longest a rental can take has passed. Returns the provider
    ids terminated now; a failed termination is retried on the next call, and its renter is told
    once what to do."""
    recovered: list[str] = []
    for launch in _orphans(rt, now):
        if _recover(rt, now, launch):
            recovered.append(launch.provider_id)
    for cut_short in _unanswered_launches(rt, now):
        recovered.extend(_recover_unanswered(rt, now, cut_short))
    return recovered


@dataclass(frozen=True)
class RecentLaunches:
    """What `/gpu rent` launched within ``ORPHAN_LOOKBACK``, which its own recovery looks after:
    (provider, provider id) of every launched instance, and (provider, platform name) of every
    launch (what a launch whose answer never came named its instances)."""

    ids: frozenset[tuple[str, str]]
    names: frozenset[tuple[str, str]]

    def holds(self, provider: str, instance: ProviderInstance) -> bool:
        """Whether ``instance`` on ``provider`` is one of these launches."""
        if (provider, instance.provider_id) in self.ids:
            return True
        name = instance.name or ""
        return any(p == provider and name.startswith(n) for p, n in self.names if n)


def recent_launches(rt: Runtime, now: datetime) -> RecentLaunches:
    """The launches of the last ``ORPHAN_LOOKBACK`` and those this process is adopting now."""
    with rt.db.session() as session:
        rows = session.exec(
            select(AuditLog).where(
                AuditLog.action.in_(("rent_launching", "rent_launched")),  # type: ignore[attr-defined]
                AuditLog.at >= now - ORPHAN_LOOKBACK,
            )
        ).all()
    ids: set[tuple[str, str]] = set()
    names: set[tuple[str, str]] = set()
    for row in rows:
        details = _details(row)
        provider = str(details.get("provider"))
        ids.update((provider, str(i)) for i in details.get("ids") or ())
        if details.get("platform_name"):
            names.add((provider, str(details["platform_name"])))
    with _adopting_lock:
        ids.update(_adopting)
    return RecentLaunches(frozenset(ids), frozenset(names))


def wait_running(provider: Provider, provider_id: str, waiting: Waiting) -> ProviderInstance:
    """Poll the platform until the instance runs with an address. Raises ProviderError when it
    ends up stopped or terminated, or after ``waiting.running_s``."""
    deadline = waiting.monotonic() + waiting.running_s
    while True:
        current = provider.get(provider_id)
        if current.state == "running" and current.host:
            return current
        if current.state in ("stopped", "terminated", "terminating"):
            raise ProviderError(
                t(
                    "{provider}: {id} became {state} before it ran.",
                    provider=provider.name,
                    id=provider_id,
                    state=current.raw_state,
                ),
                retryable=False,
            )
        if waiting.monotonic() >= deadline:
            raise ProviderError(
                t(
                    "{provider}: {id} was not running after {seconds:g} s (still {state}).",
                    provider=provider.name,
                    id=provider_id,
                    seconds=waiting.running_s,
                    state=current.raw_state,
                ),
                retryable=False,
                hint=t("Try again later or another type; it was terminated so it does not bill."),
            )
        waiting.sleep(waiting.poll_s)


def wait_ssh(host: str, port: int, waiting: Waiting) -> None:
    """Wait until ``host:port`` accepts TCP connections. Raises ProviderError after
    ``waiting.ssh_s``."""
    deadline = waiting.monotonic() + waiting.ssh_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(waiting.poll_s, 10.0)):
                return
        except OSError as exc:
            if waiting.monotonic() >= deadline:
                raise ProviderError(
                    t(
                        "SSH on {host}:{port} did not answer within {seconds:g} s ({error}).",
                        host=host,
                        port=port,
                        seconds=waiting.ssh_s,
                        error=exc,
                    ),
                    retryable=False,
                    hint=t("Check the image starts sshd and the firewall lets the bot in."),
                ) from exc
        waiting.sleep(waiting.poll_s)


def _adopt(
    rt: Runtime,
    caller: Caller,
    plan: RentPlan,
    name: str,
    launched: ProviderInstance,
    waiting: Waiting,
) -> RegisterResult:
    ready = wait_running(plan.provider, launched.provider_id, waiting)
    # Platforms bill from launch (AWS from running, RunPod from creation, Vast's disk from
    # creation): metered from the platform's own time, else from when it was seen running.
    billed_from = ready.launched_at or launched.launched_at or rt.now()
    assert ready.host is not None
    wait_ssh(ready.host, ready.ssh_port, waiting)
    req = plan.request
    price = plan.price_micros_per_hour
    if price is None:
        price = ready.price_micros_per_hour
    if price is None:
        raise ProviderError(
            t(
                "{provider} did not report the price of {id}.",
                provider=plan.provider.name,
                id=launched.provider_id,
            ),
            retryable=False,
            hint=t("Rent again with --price."),
        )
    caps = plan.provider.capabilities
    return registration.register(
        rt,
        caller,
        RegisterRequest(
            name=name,
            address=registration.format_address(req.ssh_user, ready.host, ready.ssh_port),
            gpu_model=plan.gpu_model or ready.gpu_model,
            gpu_count=plan.gpu_count or ready.gpu_count,
            price_micros_per_hour=price,
            release_in=req.release_in,
            release_at=req.release_at,
            provider=plan.provider.name,
            provider_id=launched.provider_id,
            billing=caps.billing_increment,
            min_charge_s=caps.min_charge_s,
            disk_gb=float(req.disk_gb) if req.disk_gb else ready.disk_gb,
            storage_micros_per_gb_month=_platform_storage(rt, ready),
            project=req.project,
            python_path=req.python_path,
            key_name=req.key_name,
            agent_home=req.agent_home,
            billed_from=billed_from,
        ),
    )


def _platform_storage(rt: Runtime, seen: ProviderInstance) -> int:
    """The disk price the platform reports for the instance (micro-units per GB-month), where it
    reports one in the team's currency; else 0 (unknown until given)."""
    if seen.storage_micros_per_gb_month is None or seen.currency != rt.settings.currency:
        return 0
    return seen.storage_micros_per_gb_month


def _launch(
    rt: Runtime, caller: Caller, plan: RentPlan, launch_id: str, platform_name: str
) -> list[ProviderInstance]:
    """The provider's launch call, marked as running in this process while it runs. A refusal
    (a non-retryable error) is recorded as the launch's answer; after any other error the
    platform may still have started instances, which ``recover_orphans`` looks for later."""
    req = plan.request
    with _adopting_lock:
        _launching.add(launch_id)
    try:
        launched = plan.provider.launch(
            LaunchRequest(
                instance_type=req.instance_type,
                count=req.count,
                name=platform_name,
                ssh_key_name=req.ssh_key_name,
                region=req.region,
                image=req.image,
                disk_gb=req.disk_gb,
            )
        )
        with _adopting_lock:
            _adopting.update((plan.provider.name, i.provider_id) for i in launched)
        return launched
    except ProviderError as exc:
        if not exc.retryable:
            _audit(
                rt,
                caller,
                "rent_launch_refused",
                provider=plan.provider.name,
                launch_id=launch_id,
                error=exc.message,
            )
        raise
    finally:
        with _adopting_lock:
            _launching.discard(launch_id)


def _give_back(
    rt: Runtime, caller: Caller, provider: Provider, provider_id: str, why: GpubotError
) -> None:
    """Terminate an instance that could not be registered; say so loudly (to the caller, in
    their language) if even that fails."""
    try:
        outcome = provider.release(provider_id, "terminate")
        detail = outcome.state
    except GpubotError as exc:
        detail = f"terminating failed too: {exc.user_text()}"
        with speaking(language_for(rt, caller.user_id)):
            _notify(
                rt,
                caller.user_id,
                RentGivenBackFailed(provider.name, provider_id, why.message, exc.message),
                key=f"rent_given_back:{provider.name}:{provider_id}",
            )
    _audit(rt, caller, "rent_given_back", provider=provider.name, id=provider_id, detail=detail)


@dataclass(frozen=True)
class _Launch:
    provider: str
    provider_id: str
    name: str | None
    renter: str
    launched_at: datetime
    #: Why it was never registered, for the renter (marked English, said in their language).
    reason: str = STOPPED_WHILE_SETTING_UP


def _orphans(rt: Runtime, now: datetime) -> list[_Launch]:
    with rt.db.session() as session:
        rows = session.exec(
            select(AuditLog).where(
                AuditLog.action.in_(  # type: ignore[attr-defined]
                    ("rent_launched", "rent_given_back", "rent_recovered")
                ),
                AuditLog.at >= now - ORPHAN_LOOKBACK,
            )
        ).all()
        settled = {
            (str(d.get("provider")), str(d.get("id")))
            for d in (_details(r) for r in rows if r.action != "rent_launched")
        }
        registered = {
            (p, i)
            for p, i in session.exec(
                select(Instance.provider, Instance.provider_instance_id).where(
                    Instance.provider_instance_id.is_not(None)  # type: ignore[union-attr]
                )
            ).all()
        }
    with _adopting_lock:
        busy = set(_adopting)
    orphans: list[_Launch] = []
    for row in rows:
        if row.action != "rent_launched":
            continue
        details = _details(row)
        ids = [str(i) for i in details.get("ids") or ()]
        names = [str(n) for n in details.get("names") or ()]
        longest = timedelta(seconds=len(ids) * (WAIT_RUNNING_S + WAIT_SSH_S + REGISTER_S))
        if row.at + longest > now:
            continue
        provider = str(details.get("provider"))
        for pos, provider_id in enumerate(ids):
            key = (provider, provider_id)
            if key in settled or key in registered or key in busy:
                continue
            name = names[pos] if pos < len(names) else None
            orphans.append(_Launch(provider, provider_id, name, row.actor, row.at))
    return orphans


def _recover(rt: Runtime, now: datetime, launch: _Launch) -> bool:
    """Terminate one orphan (no network call inside a transaction) and tell its renter, in
    their language. True when terminated."""
    with speaking(language_for(rt, launch.renter)):
        return _recover_for_renter(rt, now, launch)


def _recover_for_renter(rt: Runtime, now: datetime, launch: _Launch) -> bool:
    try:
        outcome = rt.providers.get(launch.provider).release(launch.provider_id, "terminate")
    except GpubotError as exc:
        log.warning(
            "terminating orphaned rental %s %s failed: %s", launch.provider, launch.provider_id, exc
        )
        _tell_once(rt, now, launch, exc)
        return False
    _audit_bot(
        rt,
        now,
        "rent_recovered",
        provider=launch.provider,
        id=launch.provider_id,
        detail="already gone" if outcome.already_gone else outcome.state,
    )
    recovered = RentRecovered(
        launch.provider,
        launch.provider_id,
        launch.name,
        launch.launched_at,
        t(launch.reason),
        rt.settings.timezone,
    )
    _notify(
        rt,
        launch.renter,
        recovered,
        key=f"rent_recovered:{launch.provider}:{launch.provider_id}",
    )
    return True


def _tell_once(rt: Runtime, now: datetime, launch: _Launch, exc: GpubotError) -> None:
    with rt.db.session() as session:
        told = session.exec(
            select(AuditLog.id).where(
                AuditLog.action == "rent_recover_failed",
                AuditLog.at >= launch.launched_at,
                AuditLog.details_json.contains(json.dumps(launch.provider_id)),  # type: ignore[attr-defined]
            )
        ).first()
        if told is not None:
            return
        audit.record(
            session,
            at=now,
            actor="gpubot",
            action="rent_recover_failed",
            instance_id=None,
            provider=launch.provider,
            id=launch.provider_id,
            error=exc.message,
        )
        text, body = rt.message(
            RentRecoverFailed(
                launch.provider, launch.provider_id, launch.name, t(launch.reason), exc.message
            )
        )
        message_id = outbox.enqueue(
            session,
            key=f"notice:rent_recover_failed:{launch.provider}:{launch.provider_id}",
            kind="notice",
            recipient=launch.renter,
            text=text,
            blocks=body,
            now=now,
        )
    outbox.deliver(rt, message_id)


@dataclass(frozen=True)
class _Unanswered:
    """A launch call whose answer was never recorded."""

    provider: str
    launch_id: str
    platform_name: str
    instance_type: str
    renter: str
    started_at: datetime


#: Audit actions that answer a ``rent_launching`` row (by its launch id).
_LAUNCH_ANSWERS = ("rent_launched", "rent_launch_refused", "rent_launch_checked")


def _unanswered_launches(rt: Runtime, now: datetime) -> list[_Unanswered]:
    with rt.db.session() as session:
        rows = session.exec(
            select(AuditLog).where(
                AuditLog.action.in_(("rent_launching", *_LAUNCH_ANSWERS)),  # type: ignore[attr-defined]
                AuditLog.at >= now - ORPHAN_LOOKBACK,
            )
        ).all()
    answered = {_details(r).get("launch_id") for r in rows if r.action != "rent_launching"}
    with _adopting_lock:
        running = set(_launching)
    found: list[_Unanswered] = []
    for row in rows:
        details = _details(row)
        launch_id = str(details.get("launch_id") or "")
        if row.action != "rent_launching" or not launch_id or launch_id in answered:
            continue
        if launch_id in running or row.at + LAUNCH_CALL > now:
            continue
        found.append(
            _Unanswered(
                provider=str(details.get("provider")),
                launch_id=launch_id,
                platform_name=str(details.get("platform_name") or ""),
                instance_type=str(details.get("instance_type")),
                renter=row.actor,
                started_at=row.at,
            )
        )
    return found


def _recover_unanswered(rt: Runtime, now: datetime, launch: _Unanswered) -> list[str]:
    """Find what an unanswered launch started (by its name on the platform), terminate it and
    tell the renter. Returns the provider ids terminated; on any failure nothing is recorded as
    settled, so the next call tries again (the renter is told of a failed termination once)."""
    try:
        provider = rt.providers.get(launch.provider)
        listed = provider.list_instances() if launch.platform_name else []
    except GpubotError as exc:
        log.warning("looking for the rental cut short %s failed: %s", launch.launch_id, exc)
        return []
    started = [
        i for i in listed if (i.name or "").startswith(launch.platform_name) and not i.is_gone
    ]
    terminated: list[str] = []
    for inst in started:
        orphan = _Launch(
            launch.provider,
            inst.provider_id,
            inst.name,
            launch.renter,
            launch.started_at,
            reason=ANSWER_NEVER_CAME,
        )
        if not _recover(rt, now, orphan):
            return terminated
        terminated.append(inst.provider_id)
    _audit_bot(
        rt,
        now,
        "rent_launch_checked",
        provider=launch.provider,
        launch_id=launch.launch_id,
        terminated=terminated,
    )
    if not started:
        checked = RentLaunchChecked(
            launch.provider,
            launch.instance_type,
            launch.started_at,
            launch.platform_name,
            rt.settings.timezone,
        )
        with speaking(language_for(rt, launch.renter)):
            _notify(rt, launch.renter, checked, key=f"rent_launch_checked:{launch.launch_id}")
    return terminated


def _details(row: AuditLog) -> dict[str, Any]:
    try:
        details = json.loads(row.details_json)
    except ValueError:
        return {}
    return details if isinstance(details, dict) else {}


def _base_name(req: RentRequest) -> str:
    return req.name or f"{req.provider}-{req.instance_type}".lower().replace(".", "-").replace(
        "_", "-"
    )


def _names(req: RentRequest) -> tuple[str, ...]:
    base = _base_name(req)
    if req.count == 1:
        return (registration.validate_name(base),)
    return tuple(registration.validate_name(f"{base}-{i}") for i in range(1, req.count + 1))


def _check_free(rt: Runtime, names: tuple[str, ...]) -> None:
    with rt.db.session() as session:
        taken = session.exec(
            select(Instance.name).where(
                Instance.state != "released",
                Instance.name.in_(names),  # type: ignore[attr-defined]
            )
        ).all()
    if taken:
        raise Conflict(
            t("The name {name} is in use.", name=taken[0]), hint=t("Pick another with --name NAME.")
        )


def _type_facts(
    provider: Provider, instance_type: str
) -> tuple[str | None, int | None, int | None]:
    """(GPU model, GPU count, price per hour) of a type, where the platform says."""
    describe = getattr(provider, "instance_type", None)
    if callable(describe):
        info = describe(instance_type)
        return info.gpu_model, info.gpu_count, provider.price(instance_type)
    for info in provider.instance_types():
        if info.name == instance_type:
            return info.gpu_model, info.gpu_count, info.price_micros_per_hour
    return None, None, provider.price(instance_type)


def _notify(rt: Runtime, recipient: str, notice: Notice, *, key: str) -> None:
    """Say ``notice`` to ``recipient`` once through the outbox (see prompts.notify), in the
    active language."""
    text, body = rt.message(notice)
    prompts.notify(rt, recipient, text, body, key=key)


def _audit_bot(rt: Runtime, now: datetime, action: str, **details: object) -> None:
    """An audit row written by the bot itself (no instance)."""
    with rt.db.session() as session:
        audit.record(session, "gpubot", action, None, at=now, **details)


def _audit(rt: Runtime, caller: Caller, action: str, **details: object) -> None:
    with rt.db.session() as session:
        audit.record(session, caller.user_id, action, None, at=rt.now(), **details)
