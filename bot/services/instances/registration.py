"""Registering instances: adopt a machine (pin its host key, install and run the agent, check
its GPUs), register it again or rename it, and the instance ``local`` of the console.

Every network call (SSH, provider API) happens outside a database transaction; transactions are
short and come after. Changes are authorised (bot.services.access) and audited
(bot.services.speaking.audit) in the same transaction as the change. Errors are bot.errors types.
Delivered GPUs that differ from the rented ones are said in the reply and told once to the ops
channel (:class:`GpuMismatch`, in the workspace's language); status and list show them for as
long as they differ. A new registration, and a re-registration that moves the deadline later,
pass the budget check of ``extend`` (bot.services.money.budgets.check_budget).

What a registration claims is checked (bot.services.instances.instance_trust): the host is resolved
once and the address that answered is what is dialled and stored; from Slack it must lie in
GPUBOT_INSTANCE_NETWORKS, a member's failed dials read the same and are limited; a provider id
must be the platform's record of the machine at that address and SSH port (``Provider.get``,
outside any transaction). A re-registration keeps the platform and its id unless both are given
again; changing them is an admin's act, audited as ``provider_changed``.

Why one module of this size: a registration is one ordered walk (check the claim, dial, pin the
key, install the agent, check the GPUs, store) whose network steps and short transactions
alternate; the trust checks it relies on are bot.services.instances.instance_trust.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import exc as sa_exc
from sqlmodel import Session, col, select

from agents.protocol import StatusSnapshot
from bot import billing
from bot import text as bot_text
from bot.errors import Conflict, FleetError, NotAuthorized, UsageError
from bot.fleet import keys
from bot.fleet.base import LOCAL_HOST, HostKey, Target
from bot.i18n import N_, speaking, t
from bot.notify import Notice
from bot.providers.registry import KNOWN_PROVIDERS, platform_billing
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import instance_trust, key_grants
from bot.services.instances.fleet_views import health_view
from bot.services.instances.lifecycle import check_cap, require_future
from bot.services.instances.lookup import (
    KIND_HOST_KEY_CHANGED,
    POLLED_STATES,
    HostKeyAlert,
    compare_gpus,
    echo,
    ensure_person,
    get_live_instance,
    gpu_views,
    instance_view,
    live_by_name,
    local_agent_home,
    presented_text,
    settings_view,
    status_columns,
)
from bot.services.instances.views import (
    STORAGE_HINT,
    InstanceSettings,
    InstanceView,
    RegisterResult,
)
from bot.services.money import budgets, rule_changes
from bot.services.speaking import audit, prompts
from bot.store.models import Instance, Prompt

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")
NAME_HINT = N_("Use 1-31 lowercase letters, digits and dashes, starting with a letter or digit.")
_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_HOST_LABEL_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
ADDRESS_HINT = N_(
    "Write USER@HOST or USER@HOST:PORT, like root@203.0.113.7:2222 or ubuntu@[2001:db8::1]:22."
)
MAX_GPU_COUNT = 64
LOCAL_NAME = access.LOCAL_NAME
#: Agent homes of registrations, relative to the login directory on the instance.
AGENT_HOMES = ".gpu-agent/registrations"


@dataclass(frozen=True)
class Address:
    """Where SSH reaches an instance; ``host`` is ``local`` for the bot's own machine."""

    user: str
    host: str
    port: int = 22


@dataclass(frozen=True)
class RegisterRequest:
    """What `/gpu register` asks for, already typed. ``price_micros_per_hour`` is per instance;
    ``release_in`` and ``release_at`` (naive UTC) are exclusive; neither means the default."""

    name: str
    address: str
    gpu_model: str | None = None
    gpu_count: int | None = None
    price_micros_per_hour: int = 0
    release_in: timedelta | None = None
    release_at: datetime | None = None
    #: The platform and its id of the instance; None: ``manual`` for a new registration, and
    #: for a re-registration the ones it has (a change needs both, and an admin).
    provider: str | None = None
    provider_id: str | None = None
    billing: str | None = None
    min_charge_s: int | None = None
    disk_gb: float | None = None
    storage_micros_per_gb_month: int = 0
    project: str | None = None
    python_path: str | None = None
    key_name: str | None = None
    agent_home: str | None = None
    #: For an instance the bot rented: when the platform started billing it (naive UTC: its
    #: creation or running time), so a new registration is metered from then, not from the
    #: moment SSH answered. Ignored unless within ``BILLED_FROM_MAX_AGE`` before now.
    billed_from: datetime | None = None


#: How long before its registration a rented instance may have started billing (a launch that
#: took longer than this to answer SSH was given back, so an older time is not this launch's).
BILLED_FROM_MAX_AGE = timedelta(hours=6)


@dataclass(frozen=True)
class _Registration:
    """A registration ready to store: ``holder`` is the live registration of the same machine
    it changes (None for a new one); ``deadline_at`` None keeps the holder's deadline."""

    name: str
    identity: access.MachineIdentity
    holder: Instance | None
    fields: dict[str, object]
    deadline_at: datetime | None
    now: datetime
    billed_from: datetime | None = None
    #: The platform and id it had before, when this re-registration changes them (an admin's).
    provider_before: tuple[str, str | None] | None = None


@dataclass(frozen=True)
class GpuMismatch(Notice):
    """To the ops channel: the registration ``result`` delivered other GPUs than were rented
    (``result.mismatch`` says how)."""

    result: RegisterResult


def register(rt: Runtime, caller: Caller, req: RegisterRequest) -> RegisterResult:
    """Adopt an instance: pin its host key, install and run the agent, quick health check,
    compare the delivered GPUs with the rented ones, then store it with its deadline and
    billing.

    A machine has one live registration (bot.services.access): registering a machine someone
    holds is refused, naming the holder, unless the caller owns it or is an admin; then it is a
    re-registration (same name) or a rename (another name), which re-pins its key and is
    checked like ``extend`` when it moves the deadline later. A new registration is checked
    against the caller's and the project's budgets before the machine is changed. Without
    ``release_in``/``release_at`` a new registration gets the default deadline
    (``default_release_in_s``; the result says so). New billing rules apply from now.

    Nothing is stored when anything fails. Raises UsageError (bad input), Conflict (name or
    machine in use), NotAuthorized, BudgetExceeded, ConfigError/NotFound/ProviderError
    (provider), FleetError subclasses."""
    name = validate_name(req.name)
    address = parse_address(req.address)
    access.refuse_local(rt, name, address.host)
    _validate(rt, req)
    key_path = key_grants.usable_key(rt, caller, req.key_name) if req.key_name else None
    attempt = _Attempt.take(rt, caller)
    try:
        result = _register(rt, caller, req, name, address, key_path, attempt)
    except BaseException:
        attempt.failed()
        raise
    attempt.succeeded()
    return result


@dataclass
class _Attempt:
    """One registration attempt from Slack, counted by the limiter from its start; it stays
    counted only when it failed to resolve or dial, or its address was refused (``probe``):
    what a scan of the bot's network runs into. None of it in the console."""

    rt: Runtime
    caller: Caller
    at: datetime | None
    probe: bool = False

    @classmethod
    def take(cls, rt: Runtime, caller: Caller) -> _Attempt:
        if rt.console:
            return cls(rt, caller, None)
        at = rt.now()
        instance_trust.limiter(rt).take(caller.user_id, at)
        return cls(rt, caller, at)

    def failed(self) -> None:
        if self.at is not None:
            limiter = instance_trust.limiter(self.rt)
            limiter.settle(self.caller.user_id, self.at, failed=self.probe)

    def succeeded(self) -> None:
        if self.at is not None:
            instance_trust.limiter(self.rt).settle(self.caller.user_id, self.at, failed=False)


def _register(
    rt: Runtime,
    caller: Caller,
    req: RegisterRequest,
    name: str,
    address: Address,
    key_path: Path | None,
    attempt: _Attempt,
) -> RegisterResult:
    now = rt.now()
    # Before the machine is asked anything: refuse a machine that is someone else's.
    _refuse_others_machine(
        rt, caller, name, _identity(address, req.provider or "manual", req.provider_id, None)
    )
    resolved = _resolve(rt, caller, req, address, attempt)
    attempt.probe = True
    host_key, address = _scan(rt, caller, req, name, address, resolved)
    attempt.probe = False
    holder, platform = _holder_and_platform(rt, caller, req, name, address, host_key)
    provider_name, provider_id = platform
    seen = None
    if provider_id and resolved is not None:
        provider = rt.providers.get(provider_name)
        dialled = instance_trust.Resolved(address.host, (address.host,))
        seen = instance_trust.prove_platform(provider, provider_id, dialled, address.port)
        instance_trust.check_platform_host_key(
            provider, seen, host_key.fingerprint if host_key else None
        )
    identity = _identity(
        address, provider_name, provider_id, host_key.fingerprint if host_key else None
    )
    deadline_at = _deadline(rt, req, now, holder)
    if holder is None:
        budgets.check_budget(rt, caller, caller.user_id, req.project)
    elif deadline_at is not None:
        _check_later_deadline(rt, caller, holder, deadline_at, req.project or holder.project)
    target = Target(
        name=name,
        host=address.host,
        port=address.port,
        user=address.user,
        key_path=str(key_path) if key_path else None,
        host_key=host_key,
        python_path=req.python_path,
        agent_home=_agent_home(rt, req, address, holder),
    )
    rt.fleet.forget(name)
    try:
        agent = rt.fleet.agent(target)
        version = agent.ensure_agent()
        status = agent.status()
        report = agent.health(
            python=req.python_path, expect_gpu=req.gpu_model, expect_count=req.gpu_count
        )
    except FleetError as exc:
        rt.fleet.forget(name)
        attempt.probe = True
        raise instance_trust.dial_failure(rt, caller, req.address, exc) from exc
    mismatch = compare_gpus(req.gpu_model, req.gpu_count, status)
    fields = _instance_fields(req, target, status, version, now)
    if holder is not None and req.disk_gb is None:
        # A re-registration that does not say the disk keeps it, and what it costs.
        fields.pop("disk_gb")
        if not req.storage_micros_per_gb_month:
            fields.pop("storage_micros_per_gb_month")
    fields.update(provider=provider_name, provider_instance_id=provider_id)
    changed = holder is not None and (holder.provider, holder.provider_instance_id) != platform
    if req.billing is None and provider_name != "manual" and (holder is None or changed):
        fields["billing_increment"] = _configured_increment(rt, provider_name)
    stored = _store_registration(
        rt,
        caller,
        _Registration(
            name,
            identity,
            holder,
            fields,
            deadline_at,
            now,
            _billed_from(req.billed_from, now),
            provider_before=(
                (holder.provider, holder.provider_instance_id)
                if holder is not None and changed
                else None
            ),
        ),
    )
    if holder is not None and holder.name != name:
        rt.fleet.forget(holder.name)
    view = instance_view(stored)
    defaulted = holder is None and deadline_at is not None and not _deadline_given(req)
    result = RegisterResult(
        instance=view,
        host_key_fingerprint=host_key.fingerprint if host_key else None,
        agent_version=version,
        health=health_view(view, report, full=False),
        gpus=gpu_views(status),
        mismatch=mismatch,
        re_registered=holder is not None,
        now=now,
        timezone=rt.settings.timezone,
        settings=settings_view(stored),
        default_deadline_s=rt.settings.default_release_in_s if defaulted else None,
    )
    if mismatch is not None:
        _announce_mismatch(rt, caller, result, req, status)
    return result


def ensure_local_instance(rt: Runtime, owner_id: str) -> InstanceView:
    """The instance ``local`` (the machine the bot runs on), stored when missing; no deadline,
    no price, nothing pinned. Idempotent, also when two callers race. Only the console has it
    (raises NotAuthorized elsewhere)."""
    access.refuse_local(rt, LOCAL_NAME, LOCAL_HOST)
    now = rt.now()
    for _ in range(2):
        with rt.db.session() as session:
            found = live_by_name(session, LOCAL_NAME)
            if found is not None:
                return instance_view(found)
        try:
            with rt.db.session() as session:
                ensure_person(session, owner_id, None)
                inst = Instance(
                    name=LOCAL_NAME,
                    owner_id=owner_id,
                    state="active",
                    host=LOCAL_HOST,
                    port=0,
                    ssh_user=getpass.getuser(),
                    provider="manual",
                    agent_home=local_agent_home(rt),
                    currency=rt.settings.currency,
                    created_at=now,
                    ssh_ready_at=now,
                )
                session.add(inst)
                session.flush()
                audit.record(session, owner_id, "register", inst.id, at=now, local=True)
                return instance_view(inst)
        except sa_exc.IntegrityError:
            continue  # someone else stored it meanwhile: read theirs
    raise Conflict(t("The instance local could not be stored."), hint=t("Try again."))


def validate_name(text: str) -> str:
    """An instance name as typed. Raises UsageError when it does not fit the pattern."""
    return bot_text.instance_name(text)


def parse_address(text: str) -> Address:
    """``USER@HOST[:PORT]`` (IPv6 hosts in brackets, ``[::1]:2222``), or ``local``.

    Raises UsageError naming what is wrong."""
    raw = text.strip()
    if raw == LOCAL_HOST:
        return Address(user=getpass.getuser(), host=LOCAL_HOST, port=0)
    user, at, rest = raw.rpartition("@")
    if not at or not user:
        raise UsageError(
            t("{address!r} has no user name.", address=echo(raw)), hint=t(ADDRESS_HINT)
        )
    if not _USER_RE.fullmatch(user):
        raise UsageError(
            t("{user!r} is not a valid user name.", user=echo(user)), hint=t(ADDRESS_HINT)
        )
    host, port = _split_host_port(rest, raw)
    return Address(user=user, host=host, port=port)


def format_address(user: str, host: str, port: int = 22) -> str:
    """``user@host:port`` as :func:`parse_address` reads it back (IPv6 hosts in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"{user}@{shown}:{port}"


def registration_record(inst: Instance) -> dict[str, object]:
    """Everything a registration says, for the audit log (no secrets are stored on a row)."""
    return {name: getattr(inst, name) for name in _RECORDED}


_RECORDED = (
    "name",
    "owner_id",
    "project",
    "state",
    "host",
    "port",
    "ssh_user",
    "ssh_key_name",
    "ssh_key_path",
    "host_key_type",
    "host_key_fingerprint",
    "python_path",
    "agent_home",
    "agent_version",
    "provider",
    "provider_instance_id",
    "gpu_model",
    "delivered_gpu_name",
    "deadline_at",
    "lifetime_cap_at",
    *billing.BILLED_FIELDS,
)


def host_key_prompt(rt: Runtime, session: Session, prompt: Prompt, inst: Instance) -> Notice | None:
    """What an undelivered host key alert says now; None once the instance was registered
    again with the presented key, or released."""
    del rt, session
    if inst.state == "released" or inst.host_key_fingerprint == prompt.key:
        return None
    return HostKeyAlert(
        instance=instance_view(inst),
        expected=inst.host_key_fingerprint or t("unknown"),
        presented=presented_text(prompt.key),
    )


def _validate(rt: Runtime, req: RegisterRequest) -> None:
    if req.gpu_count is not None and not 1 <= req.gpu_count <= MAX_GPU_COUNT:
        raise UsageError(
            t("--count {count} is not a GPU count.", count=req.gpu_count),
            hint=t("Use 1 to {most}.", most=MAX_GPU_COUNT),
        )
    if req.gpu_model is not None and not req.gpu_model.strip():
        raise UsageError(t("--gpu needs a model."), hint=t("Like --gpu a100 or --gpu 4090."))
    if req.release_in is not None and req.release_at is not None:
        raise UsageError(
            t("Give --release-in or --release-at, not both."), hint=t("Like --release-in 3h.")
        )
    if req.price_micros_per_hour < 0 or req.storage_micros_per_gb_month < 0:
        raise UsageError(t("Prices cannot be negative."), hint=t("Like --price 2.10/h."))
    if req.provider is not None and req.provider not in KNOWN_PROVIDERS:
        raise UsageError(
            t("{provider!r} is not a provider.", provider=echo(req.provider)),
            hint=t("Use one of: {choices}.", choices=", ".join(KNOWN_PROVIDERS)),
        )
    if req.provider is not None and req.provider != "manual" and not req.provider_id:
        raise UsageError(
            t(
                "--provider {provider} needs --provider-id, the platform's id of the instance.",
                provider=req.provider,
            ),
            hint=t("Without an id the bot cannot release it; use --provider manual instead."),
        )
    if req.billing is not None:
        billing.parse_increment(req.billing)
    if req.min_charge_s is not None and req.min_charge_s < 0:
        raise UsageError(t("--min-charge cannot be negative."), hint=t("Like --min-charge 1m."))
    if req.disk_gb is not None and req.disk_gb <= 0:
        raise UsageError(t("--disk must be a positive size in GB."), hint=t("Like --disk 200."))
    if req.project is not None and not 0 < len(req.project) <= 100:
        raise UsageError(t("--project needs a name of at most 100 characters."))
    if req.python_path is not None and not 0 < len(req.python_path) <= 1000:
        raise UsageError(
            t("--python needs a path."), hint=t("Like --python /opt/conda/bin/python.")
        )
    if req.key_name is not None:
        keys.check_key_name(req.key_name)
    rt.providers.get(req.provider or "manual")  # ConfigError when it needs configuring


def _deadline(
    rt: Runtime, req: RegisterRequest, now: datetime, holder: Instance | None
) -> datetime | None:
    """The deadline asked for; without one, the default for a new registration, and None (kept
    as it is) for a re-registration or ``local``."""
    if req.release_at is not None:
        require_future(
            rt,
            req.release_at,
            now,
            t("--release-at"),
            t("Give a later time (like --release-at 18:00), or a duration with --release-in 3h."),
        )
        return req.release_at
    if req.release_in is not None:
        if req.release_in <= timedelta(0):
            raise UsageError(t("--release-in must be positive."), hint=t("Like --release-in 3h."))
        return now + req.release_in
    if holder is not None or req.address.strip() == LOCAL_HOST:
        return None
    return now + timedelta(seconds=rt.settings.default_release_in_s)


def _deadline_given(req: RegisterRequest) -> bool:
    return req.release_in is not None or req.release_at is not None


def _identity(
    address: Address, provider: str, provider_id: str | None, fingerprint: str | None
) -> access.MachineIdentity:
    return access.MachineIdentity(
        host=address.host,
        port=address.port,
        user=address.user,
        host_key_fingerprint=fingerprint,
        provider=provider,
        provider_id=provider_id,
    )


def _resolve(
    rt: Runtime, caller: Caller, req: RegisterRequest, address: Address, attempt: _Attempt
) -> instance_trust.Resolved | None:
    """The host resolved once (None for ``local``); from Slack, checked against
    GPUBOT_INSTANCE_NETWORKS before anything is dialled. A name that does not resolve is a
    dial failure (one message for members)."""
    if address.host == LOCAL_HOST:
        return None
    attempt.probe = True
    try:
        resolved = instance_trust.resolve(address.host, address.port)
    except FleetError as exc:
        raise instance_trust.dial_failure(rt, caller, req.address, exc) from exc
    attempt.probe = False  # an address refused was not dialled: it does not count
    if not rt.console:
        instance_trust.check_addresses(rt.settings.instance_networks, resolved)
    return resolved


def _holder_and_platform(
    rt: Runtime,
    caller: Caller,
    req: RegisterRequest,
    name: str,
    address: Address,
    host_key: HostKey | None,
) -> tuple[Instance | None, tuple[str, str | None]]:
    """The registration this one changes (see :func:`_holder`) and the platform and id to
    store: the request's for a new one; for a re-registration the holder's unless both are
    given again, and then only an admin (or the console) may change them."""
    fingerprint = host_key.fingerprint if host_key else None
    given = _identity(address, req.provider or "manual", req.provider_id, fingerprint)
    holder = _holder(rt, caller, name, given)
    if holder is None:
        return None, (req.provider or "manual", req.provider_id)
    kept = (holder.provider, holder.provider_instance_id)
    if req.provider_id is None or (
        req.provider_id == holder.provider_instance_id and req.provider in (None, holder.provider)
    ):
        return holder, kept
    if req.provider is None:
        raise UsageError(
            t(
                "{name} is registered on {provider}; --provider-id needs --provider to change it.",
                name=holder.name,
                provider=holder.provider,
            ),
            hint=t("Leave both out to keep them."),
        )
    wanted = (req.provider, req.provider_id)
    if wanted != kept and not (rt.console or access.is_admin(rt, caller)):
        raise NotAuthorized(
            t(
                "Only an admin can change the platform or the platform's id of {name} "
                "({provider} {id}).",
                name=holder.name,
                provider=holder.provider,
                id=echo(holder.provider_instance_id or "-"),
            ),
            hint=t("Register it again without --provider and --provider-id to keep them."),
        )
    return holder, wanted


def _refuse_others_machine(
    rt: Runtime, caller: Caller, name: str, identity: access.MachineIdentity
) -> None:
    """Raise Conflict naming the holder when the machine is someone else's (by what is known
    before it is dialled: its address, its provider id)."""
    with rt.db.session() as session:
        access.holder_for_registration(rt, caller, access.machine_holders(session, identity), name)


def _scan(
    rt: Runtime,
    caller: Caller,
    req: RegisterRequest,
    name: str,
    address: Address,
    resolved: instance_trust.Resolved | None,
) -> tuple[HostKey | None, Address]:
    """The host key the machine presents (None for ``local``) and the address that presented
    it: each resolved address in turn, the first that answers (what is stored and dialled
    from then on). When none answers and the name is someone else's, the answer is that the
    name is taken (refused either way); else one message for members (the reason for
    admins)."""
    if resolved is None:
        return None, address
    failure: FleetError | None = None
    for host in resolved.addresses:
        try:
            return rt.fleet.scan_host_key(host, address.port), replace(address, host=host)
        except FleetError as exc:
            failure = exc
    assert failure is not None
    with rt.db.session() as session:
        by_name = live_by_name(session, name)
    if by_name is None or access.is_owner(caller, by_name) or access.is_admin(rt, caller):
        raise instance_trust.dial_failure(rt, caller, req.address, failure) from failure
    raise _name_taken(name, by_name) from failure


def _name_taken(name: str, by_name: Instance) -> Conflict:
    return Conflict(
        t(
            "The name {name} is taken by an instance at {address} (owner <@{owner}>).",
            name=name,
            address=instance_view(by_name).address,
            owner=by_name.owner_id,
        ),
        hint=t("Choose another name, or release that instance first."),
    )


def _holder(
    rt: Runtime, caller: Caller, name: str, identity: access.MachineIdentity
) -> Instance | None:
    """The live registration this one changes (None for a new machine). Raises Conflict when
    the machine is someone else's, the name is taken by another machine, or the holder is
    being released."""
    with rt.db.session() as session:
        holders = access.machine_holders(session, identity)
        holder = access.holder_for_registration(rt, caller, holders, name)
        by_name = live_by_name(session, name)
    if by_name is not None and (holder is None or by_name.id != holder.id):
        raise _name_taken(name, by_name)
    if holder is not None and holder.state not in POLLED_STATES:
        raise Conflict(
            t(
                "{name} is {state}; it cannot be registered again now.",
                name=holder.name,
                state=access.state_words(holder.state),
            ),
            hint=t("Wait until the release is done, then register it anew."),
        )
    return holder


def _check_later_deadline(
    rt: Runtime, caller: Caller, holder: Instance, deadline_at: datetime, project: str | None
) -> None:
    """A re-registration that moves the deadline later is checked like ``extend``: the
    lifetime cap and a used-up budget stop anyone but an admin."""
    if holder.deadline_at is not None and deadline_at <= holder.deadline_at:
        return
    check_cap(rt, caller, holder, deadline_at, t("re-registering with that deadline"))
    budgets.check_budget(rt, caller, holder.owner_id, project)


def _instance_fields(
    req: RegisterRequest, target: Target, status: StatusSnapshot, version: str, now: datetime
) -> dict[str, object]:
    names = sorted({g.name for g in status.gpus})
    host_key = target.host_key
    fields: dict[str, object] = {
        "host": target.host,
        "port": target.port,
        "ssh_user": target.user,
        "ssh_key_name": req.key_name,
        "ssh_key_path": None,
        "host_key_type": host_key.key_type if host_key else None,
        "host_key_b64": host_key.key_b64 if host_key else None,
        "host_key_fingerprint": host_key.fingerprint if host_key else None,
        "python_path": req.python_path,
        "agent_home": target.agent_home,
        "agent_version": version,
        "gpu_model": req.gpu_model,
        "gpu_count": req.gpu_count,
        "delivered_gpu_name": ", ".join(names)[:128] or None,
        "delivered_gpu_count": len(status.gpus),
        "price_micros": req.price_micros_per_hour,
        "storage_micros_per_gb_month": req.storage_micros_per_gb_month,
        "disk_gb": req.disk_gb,
        "project": req.project,
        "ssh_ready_at": now,
        **status_columns(status),
        "last_status_at": now,
        "last_error": None,
    }
    if req.billing is not None:
        fields["billing_increment"] = billing.parse_increment(req.billing)
    if req.min_charge_s is not None:
        fields["min_charge_s"] = req.min_charge_s
    return fields


def _store_registration(rt: Runtime, caller: Caller, reg: _Registration) -> Instance:
    """Store a new registration, or change its holder, in one transaction that checks the
    machine's holders again; the live unique indexes settle a race. Raises Conflict."""
    try:
        with rt.db.session() as session:
            ensure_person(session, caller.user_id, caller.user_name)
            holders = access.machine_holders(session, reg.identity)
            current = access.holder_for_registration(rt, caller, holders, reg.name)
            held_id = reg.holder.id if reg.holder is not None else None
            if (current.id if current is not None else None) != held_id:
                raise Conflict(
                    t("{name} changed while it was being registered.", name=reg.name),
                    hint=t("Register it again."),
                )
            if reg.holder is not None:
                return _re_register(rt, session, caller, reg)
            return _new_registration(rt, session, caller, reg)
    except sa_exc.IntegrityError as exc:
        rt.fleet.forget(reg.name)
        raise _clash(rt, caller, reg) from exc


def _new_registration(
    rt: Runtime, session: Session, caller: Caller, reg: _Registration
) -> Instance:
    inst = Instance(
        name=reg.name,
        owner_id=caller.user_id,
        channel_id=caller.channel_id,
        state="active",
        currency=rt.settings.currency,
        created_at=reg.billed_from or reg.now,
        deadline_at=reg.deadline_at,
        **reg.fields,  # type: ignore[arg-type]
    )
    session.add(inst)
    session.flush()
    audit.record(
        session, caller.user_id, "register", inst.id, at=reg.now, after=registration_record(inst)
    )
    return inst


def _configured_increment(rt: Runtime, provider_name: str) -> str | None:
    """The increment the configured provider bills by where it is not its platform's documented
    one (Compshare's is a setting, see bot.providers.compshare): stored, so a later change of
    the setting leaves this instance's bill alone; None (not said: the platform's applies)
    where it is."""
    configured = rt.providers.get(provider_name).capabilities.billing.increment
    return None if configured == platform_billing(provider_name).increment else configured


def _billed_from(given: datetime | None, now: datetime) -> datetime | None:
    """The platform's billing start when it is plausible (not after now, not older than
    ``BILLED_FROM_MAX_AGE``), else None (metered from now)."""
    if given is None or given > now or now - given > BILLED_FROM_MAX_AGE:
        return None
    return given


def _re_register(rt: Runtime, session: Session, caller: Caller, reg: _Registration) -> Instance:
    """Re-pin and refresh the holder: a rename when the name differs; a new deadline when
    given (else kept); new billing rules from now on, what was used charged at the old ones
    (the ledger is closed up to now first). The audit row holds the whole before and after."""
    assert reg.holder is not None
    inst = session.get(Instance, reg.holder.id)
    if (
        inst is None
        or inst.state not in POLLED_STATES
        or inst.deadline_at != reg.holder.deadline_at
    ):
        raise Conflict(
            t("{name} changed while it was being registered again.", name=reg.holder.name),
            hint=t("Register it again."),
        )
    before = registration_record(inst)
    changes = {key: value for key, value in reg.fields.items() if key != "ssh_ready_at"}
    if rule_changes.rules_change(inst, changes):
        changes.update(rule_changes.close_rules(session, inst, reg.now, rt.settings.tz()))
    for key, value in changes.items():
        setattr(inst, key, value)
    inst.name = reg.name
    if reg.deadline_at is not None:
        inst.deadline_at = reg.deadline_at
    session.add(inst)
    session.flush()
    for prompt in session.exec(
        select(Prompt)
        .where(
            Prompt.instance_id == inst.id,
            Prompt.kind == KIND_HOST_KEY_CHANGED,
            col(Prompt.resolved_at).is_(None),
        )
        .order_by(col(Prompt.id))
    ).all():
        assert prompt.id is not None
        prompts.resolve(
            session, prompt.id, resolution="re_registered", by=caller.user_id, now=reg.now
        )
    if reg.provider_before is not None:
        audit.record(
            session,
            caller.user_id,
            "provider_changed",
            inst.id,
            at=reg.now,
            before={"provider": reg.provider_before[0], "id": reg.provider_before[1]},
            after={"provider": inst.provider, "id": inst.provider_instance_id},
        )
    action = "re_register" if reg.holder.name == reg.name else "rename"
    audit.record(
        session,
        caller.user_id,
        action,
        inst.id,
        at=reg.now,
        before=before,
        after=registration_record(inst),
    )
    return inst


def set_storage(
    rt: Runtime,
    caller: Caller,
    name: str,
    *,
    disk_gb: float | None = None,
    storage_micros_per_gb_month: int | None = None,
) -> InstanceSettings:
    """Tell the bot an instance's disk size (GB) and what its storage costs (micro-units of the
    bot's currency per GB-month): `/gpu policy NAME --disk 200 --storage 0.10/GB-month`. Works
    on a running or a stopped instance (nothing is asked of the machine); the new price applies
    from now (what the disk cost before is kept as it was). Owner or admin. Raises UsageError
    (no size to charge the price on, a size or price out of range), NotFound, NotAuthorized,
    Conflict (released or being released)."""
    if disk_gb is None and storage_micros_per_gb_month is None:
        raise UsageError(t("Nothing to change."), hint=t(STORAGE_HINT, name=name))
    if disk_gb is not None and disk_gb <= 0:
        raise UsageError(t("--disk must be a positive size in GB."), hint=t("Like --disk 200."))
    if storage_micros_per_gb_month is not None and storage_micros_per_gb_month < 0:
        raise UsageError(
            t("{name} must not be negative", name="--storage"), hint=t("Give amounts of 0 or more.")
        )
    now = rt.now()
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        access.require_owner_or_admin(rt, caller, inst, action="change")
        if inst.state not in ("active", "lost", "stopped"):
            raise Conflict(
                t("{name} is being released; its storage price can no longer change.", name=name)
            )
        disk = inst.disk_gb if disk_gb is None else disk_gb
        if disk is None:
            raise UsageError(
                t("--storage needs --disk (the size it is charged on)."),
                hint=t(STORAGE_HINT, name=inst.name),
            )
        price = (
            inst.storage_micros_per_gb_month
            if storage_micros_per_gb_month is None
            else storage_micros_per_gb_month
        )
        before = registration_record(inst)
        try:
            with session.begin_nested():
                changed = rule_changes.change_storage(
                    session, inst, disk, price, now, rt.settings.tz()
                )
        except sa_exc.IntegrityError as exc:
            # Another process wrote the charges up to now first (a change of its own).
            raise rule_changes.storage_clash(inst.name) from exc
        if changed:
            audit.record(
                session,
                caller.user_id,
                "storage",
                inst.id,
                at=now,
                before=before,
                after=registration_record(inst),
            )
        session.flush()
        return InstanceSettings(
            instance=instance_view(inst),
            settings=settings_view(inst),
            now=now,
            timezone=rt.settings.timezone,
        )


def _clash(rt: Runtime, caller: Caller, reg: _Registration) -> Conflict:
    """What a unique-key clash at the store means, read again after it."""
    try:
        with rt.db.session() as session:
            holders = access.machine_holders(session, reg.identity)
            access.holder_for_registration(rt, caller, holders, reg.name)
    except Conflict as exc:
        return exc
    return Conflict(
        t("{name} or this machine was just registered by someone else.", name=reg.name),
        hint=t("`/gpu list` shows the instances; register again if it is still free."),
    )


def _announce_mismatch(
    rt: Runtime,
    caller: Caller,
    result: RegisterResult,
    req: RegisterRequest,
    status: StatusSnapshot,
) -> None:
    """Tell the ops channel once per registration, in the workspace's language (the
    differences said again in it); the reply (in the caller's channel) already says it, so
    nothing is sent when the ops channel is that channel or there is none."""
    channel = rt.settings.channel
    if not channel or channel == caller.channel_id:
        return
    inst = result.instance
    with speaking(None):
        told = replace(result, mismatch=compare_gpus(req.gpu_model, req.gpu_count, status))
        text, body = rt.message(GpuMismatch(told))
    prompts.notify(
        rt,
        channel,
        text,
        body,
        key=f"mismatch:{inst.id}:{inst.created_at:%Y%m%d%H%M%S%f}",
        instance_id=inst.id,
    )


def _agent_home(
    rt: Runtime, req: RegisterRequest, address: Address, holder: Instance | None
) -> str | None:
    """Where the agent keeps this registration's jobs: the holder's home for a
    re-registration, else a home of its own, so two registrations that log in as one user never
    see each other's jobs (relative to the login directory)."""
    if req.agent_home:
        return req.agent_home
    if address.host == LOCAL_HOST:
        return local_agent_home(rt)
    if holder is not None:
        return holder.agent_home
    return f"{AGENT_HOMES}/{secrets.token_hex(6)}"


def _split_host_port(rest: str, raw: str) -> tuple[str, int]:
    port_text: str | None = None
    if rest.startswith("["):
        host, bracket, after = rest[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise UsageError(
                t("{address!r}: the IPv6 address is not closed.", address=echo(raw)),
                hint=t(ADDRESS_HINT),
            )
        port_text = after[1:] if after else None
        _check_ipv6(host, raw)
    elif rest.count(":") > 1:
        host = rest
        _check_ipv6(host, raw)
    else:
        host, colon, port_text_ = rest.partition(":")
        port_text = port_text_ if colon else None
        _check_hostname(host, raw)
    port = 22
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(
                t("{port!r} is not a port.", port=echo(port_text)),
                hint=t("Use 1 to {most}.", most=65535),
            )
        port = int(port_text)
    return host, port


def _check_ipv6(host: str, raw: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError as exc:
        raise UsageError(
            t("{address!r}: {host!r} is not an IPv6 address.", address=echo(raw), host=echo(host)),
            hint=t(ADDRESS_HINT),
        ) from exc


def _check_hostname(host: str, raw: str) -> None:
    if not host:
        raise UsageError(t("{address!r} has no host.", address=echo(raw)), hint=t(ADDRESS_HINT))
    if len(host) > 253 or not all(_HOST_LABEL_RE.fullmatch(p) for p in host.rstrip(".").split(".")):
        raise UsageError(
            t("{host!r} is not a host name or address.", host=echo(host)), hint=t(ADDRESS_HINT)
        )
