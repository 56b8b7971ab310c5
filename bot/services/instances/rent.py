"""`/gpu rent`: rent through a provider's API, wait until the instance runs and its SSH port
answers, then register it like `/gpu register` (host key pinned, agent installed, health checked,
meter and deadline started).

Everything that can be checked is checked before anything is rented (provider, type, names,
price, budget). An instance that was launched but could not be registered is terminated again,
so nothing is left billing unseen. Each instance asked for is a Launch row
(bot.services.instances.launches) that the renting process holds with a lease while it works;
the audit log only records what happened. ``recover_orphans`` (a step of the tick) covers the bot
stopping part-way, for the rows whose lease ran out:

- between launching and registering (launched, checked): the row knows the instance, so it is
  terminated and the person who rented it told;
- during the launch call itself (or when the call ended without an answer, as on a timeout):
  the rows were written before the call, with a launch key that is part of the name the
  instances get on the platform. Once the call cannot still be running, it looks the name up in
  the platform's list, terminates what it finds and tells the renter what happened either way;
- a termination that failed (orphaned) is tried again, and the renter told once what to do.

Each row is claimed by one process (a conditional UPDATE), so two bot processes never both adopt
nor both terminate an instance. What is said to the renter is said in their language
(bot.services.speaking.people.language_for).
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import select

from bot.errors import Conflict, GpubotError, ProviderError, ProviderNotFound, UsageError
from bot.i18n import N_, speaking, t
from bot.notify import Notice
from bot.providers.base import LaunchRequest, Provider, ProviderInstance, no_launch
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import launches, registration
from bot.services.instances.launches import Claim
from bot.services.instances.registration import RegisterRequest
from bot.services.instances.views import RegisterResult
from bot.services.money import budgets
from bot.services.speaking import audit, outbox, prompts
from bot.services.speaking.people import language_for
from bot.store.models import Instance, Launch
from bot.timebox import Timebox, expired

log = logging.getLogger(__name__)

#: How long to wait for the platform to report an instance running with an address.
WAIT_RUNNING_S = 900.0
#: How long to wait for its SSH port to accept connections after that.
WAIT_SSH_S = 300.0
POLL_S = 5.0
MAX_COUNT = 8
#: Why a launched instance was never registered, for its renter.
STOPPED_WHILE_SETTING_UP = N_("the bot stopped while setting it up")
ANSWER_NEVER_CAME = N_("the platform's answer to the launch never reached the bot")
COULD_NOT_REGISTER = N_("it could not be registered")


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
    #: How often (real seconds) the rental renews its lease on its Launch rows.
    heartbeat_s: float = launches.CLAIM_HEARTBEAT_S


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
    key = secrets.token_hex(4)
    platform_name = f"{_base_name(req) if req.count > 1 else plan.names[0]}-{key}"
    holder = launches.new_holder()
    now = rt.now()
    with rt.db.session() as session:
        launches.open_launch(
            session,
            launch_key=key,
            provider=plan.provider.name,
            instance_type=req.instance_type,
            platform_name=platform_name,
            names=plan.names,
            renter=caller.user_id,
            holder=holder,
            now=now,
        )
        audit.record(
            session,
            caller.user_id,
            "rent_launching",
            None,
            at=now,
            provider=plan.provider.name,
            launch_id=key,
            platform_name=platform_name,
            names=list(plan.names),
            instance_type=req.instance_type,
        )
    launched = {i.provider_id: i for i in _launch(rt, caller, plan, (key, platform_name), holder)}
    registered: list[RegisterResult] = []
    failed: list[tuple[str, str]] = []
    with launches.holding(rt, key, holder, every_s=waiting.heartbeat_s):
        for row in launches.rows_of(rt, key):
            if row.holder != holder or row.provider_id not in launched:
                continue
            inst = launched[row.provider_id]
            try:
                registered.append(_adopt(rt, caller, plan, row, inst, waiting, holder))
            except _TakenOver:
                failed.append((inst.provider_id, t(STOPPED_WHILE_SETTING_UP)))
            except GpubotError as exc:
                log.warning(
                    "rented %s (%s) could not be registered: %s", row.name, inst.provider_id, exc
                )
                failed.append((inst.provider_id, exc.user_text()))
                _give_back(rt, caller, plan.provider, row, holder, exc)
    return RentResult(tuple(registered), tuple(failed))


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


#: The Launch rows :func:`recover_orphans` works on at ``now`` (naive UTC), for the tick's check.
due_clause = launches.due_clause


def recover_orphans(rt: Runtime, now: datetime, *, timebox: Timebox | None = None) -> list[str]:
    """Terminate instances `/gpu rent` launched but never registered nor gave back (the bot
    stopped in between, or a termination failed), and tell whoever rented them: the Launch rows
    in progress whose lease ran out, longest due first, each claimed by this process alone.
    Returns the provider ids terminated now; a failed termination is tried again
    ``launches.RETRY_S`` later, and its renter is told once what to do. Given a ``timebox``, no
    further row is taken once it is spent (the rest stay due)."""
    recovered: list[str] = []
    holder = launches.new_holder()
    looked: set[str] = set()
    for row in launches.due(rt, now):
        if expired(timebox):
            break
        if row.state == launches.LAUNCHING:
            if row.launch_key not in looked:
                looked.add(row.launch_key)
                recovered.extend(_recover_unanswered(rt, now, row.launch_key, holder))
            continue
        claim = launches.claim_orphan(rt, row, now, holder, reason=STOPPED_WHILE_SETTING_UP)
        if claim is not None and claim.provider_id and _terminate_orphan(rt, now, claim):
            recovered.append(claim.provider_id)
    return recovered


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


class _TakenOver(Exception):
    """The rental's claim on a Launch row ran out and another process took it over."""


def _adopt(
    rt: Runtime,
    caller: Caller,
    plan: RentPlan,
    row: Launch,
    launched: ProviderInstance,
    waiting: Waiting,
    holder: str,
) -> RegisterResult:
    """Wait until the instance runs and its SSH port answers (the row: checked), register it
    (adopted). Raises GpubotError when it cannot be registered, _TakenOver when the row was
    taken over (its recovery terminates it)."""
    assert row.id is not None
    name = row.name
    if name is None:  # the platform started more than was asked for
        raise ProviderError(
            t(
                "{provider} started more instances than were asked for.",
                provider=plan.provider.name,
            ),
            retryable=False,
        )
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
    if not launches.advance(rt, row.id, holder, launches.CHECKED):
        raise _TakenOver
    result = registration.register(
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
            disk_gb=float(req.disk_gb) if req.disk_gb else ready.disk_gb,
            storage_micros_per_gb_month=_platform_storage(rt, ready),
            project=req.project,
            python_path=req.python_path,
            key_name=req.key_name,
            agent_home=req.agent_home,
            billed_from=billed_from,
        ),
    )
    if not launches.advance(rt, row.id, holder, launches.ADOPTED):
        # Registered after its lease ran out: its recovery finds the registration and leaves it.
        log.warning("rented %s (%s) was registered after its claim ran out", name, row.provider_id)
    return result


def _platform_storage(rt: Runtime, seen: ProviderInstance) -> int:
    """The disk price the platform reports for the instance (micro-units per GB-month), where it
    reports one in the team's currency; else 0 (unknown until given)."""
    if seen.storage_micros_per_gb_month is None or seen.currency != rt.settings.currency:
        return 0
    return seen.storage_micros_per_gb_month


def _launch(
    rt: Runtime, caller: Caller, plan: RentPlan, named: tuple[str, str], holder: str
) -> list[ProviderInstance]:
    """The provider's launch call (``named``: the launch key, the instances' platform name),
    its answer recorded on the launch's rows. A refusal (a non-retryable error) settles them;
    after any other error the platform may still have started instances, which
    ``recover_orphans`` looks for once the call has surely ended."""
    req, (key, platform_name) = plan.request, named
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
    except ProviderError as exc:
        if not exc.retryable:
            with rt.db.session() as session:
                now = rt.now()
                launches.record_refused(session, key, holder, exc.message, now)
                audit.record(
                    session,
                    caller.user_id,
                    "rent_launch_refused",
                    None,
                    at=now,
                    provider=plan.provider.name,
                    launch_id=key,
                    error=exc.message,
                )
        raise
    ids = [i.provider_id for i in launched]
    with rt.db.session() as session:
        now = rt.now()
        held = launches.record_answer(session, key, holder, ids, now)
        audit.record(
            session,
            caller.user_id,
            "rent_launched",
            None,
            at=now,
            provider=plan.provider.name,
            launch_id=key,
            ids=ids,
            names=list(plan.names[: len(launched)]),
            instance_type=req.instance_type,
        )
    if not held:  # the call outlasted LAUNCH_CALL and was taken over: give back what it made
        late = ProviderError(
            t("The platform answered the launch too late; what it started is terminated."),
            retryable=False,
        )
        for inst in launched:
            _terminate_given_back(rt, caller, plan.provider, inst.provider_id, late)
        raise late
    return launched


def _give_back(
    rt: Runtime, caller: Caller, provider: Provider, row: Launch, holder: str, why: GpubotError
) -> None:
    """Terminate an instance that could not be registered; say so loudly (to the caller, in
    their language) if even that fails: its row stays orphaned and recovery tries again."""
    assert row.id is not None
    claim = launches.give_up(rt, row.id, holder, reason=COULD_NOT_REGISTER)
    if claim is None or claim.provider_id is None:
        return  # taken over: its recovery terminates it
    terminated, detail, error = _terminate(provider, claim.provider_id)
    now = rt.now()
    with rt.db.session() as session:
        if terminated:
            launches.settle(session, claim, launches.TERMINATED, now, detail=detail)
        else:
            launches.retry_later(session, claim, now, error=error or detail, told=True)
        audit.record(
            session,
            caller.user_id,
            "rent_given_back",
            None,
            at=now,
            provider=provider.name,
            id=claim.provider_id,
            detail=detail,
        )
    if not terminated:
        _tell_given_back_failed(rt, caller, provider, claim.provider_id, why, error or detail)


def _terminate_given_back(
    rt: Runtime, caller: Caller, provider: Provider, provider_id: str, why: GpubotError
) -> None:
    """Terminate an instance no Launch row of this process holds, recorded in the audit log."""
    terminated, detail, error = _terminate(provider, provider_id)
    if not terminated:
        _tell_given_back_failed(rt, caller, provider, provider_id, why, error or detail)
    _audit(rt, caller, "rent_given_back", provider=provider.name, id=provider_id, detail=detail)


def _tell_given_back_failed(
    rt: Runtime, caller: Caller, provider: Provider, provider_id: str, why: GpubotError, error: str
) -> None:
    with speaking(language_for(rt, caller.user_id)):
        _notify(
            rt,
            caller.user_id,
            RentGivenBackFailed(provider.name, provider_id, why.message, error),
            key=f"rent_given_back:{provider.name}:{provider_id}",
        )


def _terminate(provider: Provider, provider_id: str) -> tuple[bool, str, str | None]:
    """Terminate on the platform (no transaction open): (terminated or gone, what the platform
    said, the error when it failed)."""
    try:
        outcome = provider.release(provider_id, "terminate")
    except ProviderNotFound:
        return True, "already gone", None
    except GpubotError as exc:
        return False, f"terminating failed too: {exc.user_text()}", exc.message
    return True, "already gone" if outcome.already_gone else outcome.state, None


def _terminate_orphan(rt: Runtime, now: datetime, claim: Claim) -> bool:
    """Terminate one claimed orphan (no platform call inside a transaction) and tell its
    renter, in their language. True when terminated now."""
    if launches.registered(rt, claim):
        with rt.db.session() as session:
            launches.settle(session, claim, launches.ADOPTED, now, detail="registered")
        return False
    with speaking(language_for(rt, claim.renter)):
        return _terminate_for_renter(rt, now, claim)


def _terminate_for_renter(rt: Runtime, now: datetime, claim: Claim) -> bool:
    assert claim.provider_id is not None
    reason = claim.reason or STOPPED_WHILE_SETTING_UP
    try:
        provider = rt.providers.get(claim.provider)
    except GpubotError as exc:
        _retry_later(rt, now, claim, exc.message)
        return False
    terminated, detail, error = _terminate(provider, claim.provider_id)
    if not terminated:
        log.warning(
            "terminating orphaned rental %s %s failed: %s", claim.provider, claim.provider_id, error
        )
        _retry_later(rt, now, claim, error or detail)
        return False
    with rt.db.session() as session:
        won = launches.settle(session, claim, launches.TERMINATED, now, detail=detail)
        if won:
            audit.record(
                session,
                "gpubot",
                "rent_recovered",
                None,
                at=now,
                provider=claim.provider,
                id=claim.provider_id,
                detail=detail,
            )
    if not won:
        return False
    recovered = RentRecovered(
        claim.provider,
        claim.provider_id,
        claim.name,
        claim.started_at,
        t(reason),
        rt.settings.timezone,
    )
    _notify(rt, claim.renter, recovered, key=f"rent_recovered:{claim.provider}:{claim.provider_id}")
    return True


def _retry_later(rt: Runtime, now: datetime, claim: Claim, error: str) -> None:
    """Terminating failed: due again later; the renter is told once, with the record."""
    assert claim.provider_id is not None
    message_id: int | None = None
    with rt.db.session() as session:
        if not launches.retry_later(session, claim, now, error=error, told=not claim.told):
            return
        if claim.told:
            return
        audit.record(
            session,
            at=now,
            actor="gpubot",
            action="rent_recover_failed",
            instance_id=None,
            provider=claim.provider,
            id=claim.provider_id,
            error=error,
        )
        reason = t(claim.reason or STOPPED_WHILE_SETTING_UP)
        text, body = rt.message(
            RentRecoverFailed(claim.provider, claim.provider_id, claim.name, reason, error)
        )
        message_id = outbox.enqueue(
            session,
            key=f"notice:rent_recover_failed:{claim.provider}:{claim.provider_id}",
            kind="notice",
            recipient=claim.renter,
            text=text,
            blocks=body,
            now=now,
        )
    if message_id is not None:
        outbox.deliver(rt, message_id)


def _recover_unanswered(rt: Runtime, now: datetime, key: str, holder: str) -> list[str]:
    """Find what a launch that never answered started (by its name on the platform),
    terminate it and tell the renter. Returns the provider ids terminated now; when the
    platform cannot be asked, the launch is due again once this claim runs out."""
    claims = launches.claim_unanswered(rt, key, now, holder)
    if not claims:
        return []
    first = claims[0]
    try:
        provider = rt.providers.get(first.provider)
        listed = provider.list_instances() if first.platform_name else []
    except GpubotError as exc:
        log.warning("looking for the rental cut short %s failed: %s", key, exc)
        return []
    started = [
        i.provider_id
        for i in listed
        if (i.name or "").startswith(first.platform_name) and not i.is_gone
    ]
    with rt.db.session() as session:
        orphans = launches.found_unanswered(session, claims, started, now, reason=ANSWER_NEVER_CAME)
        audit.record(
            session,
            "gpubot",
            "rent_launch_checked",
            None,
            at=now,
            provider=first.provider,
            launch_id=key,
            found=started,
        )
    terminated = [o.provider_id for o in orphans if o.provider_id and _terminate_orphan(rt, now, o)]
    if not started:
        checked = RentLaunchChecked(
            first.provider,
            first.instance_type,
            first.started_at,
            first.platform_name,
            rt.settings.timezone,
        )
        with speaking(language_for(rt, first.renter)):
            _notify(rt, first.renter, checked, key=f"rent_launch_checked:{key}")
    return [p for p in terminated if p]


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


def _audit(rt: Runtime, caller: Caller, action: str, **details: object) -> None:
    with rt.db.session() as session:
        audit.record(session, caller.user_id, action, None, at=rt.now(), **details)
