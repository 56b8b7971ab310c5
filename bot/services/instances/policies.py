"""What an instance does at its deadline, and how long it may live: `/gpu policy` (release,
wait for its jobs, or stop; the idle rule) and an admin's lifetime cap (`/gpu cap`).

A policy or a cap is a column of the instance, changed in one short transaction and recorded
in the audit log; the clock's deadline rules (bot.services.instances.deadlines) read them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlmodel import Session, col

from bot.errors import (
    Conflict,
    NotAuthorized,
    UsageError,
)
from bot.i18n import t
from bot.providers.names import platform_name
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import releases
from bot.services.instances.deadlines import STOP_POLICY
from bot.services.instances.lifecycle import require_future
from bot.services.instances.lookup import get_live_instance
from bot.services.speaking import audit
from bot.store.models import Instance
from bot.values import format_duration

log = logging.getLogger(__name__)

POLICIES = ("release", "wait-for-jobs", STOP_POLICY)


@dataclass(frozen=True)
class PolicyChange:
    """What ``set_policy`` may change; None leaves a field as it is. ``idle_release_after_s``
    0 turns idle release off. ``release_after_s``: with policy ``stop``, how long after the
    deadline the stopped instance is released (kept as the instance's ``max_grace_s``)."""

    at_deadline: str | None = None
    max_grace_s: int | None = None
    idle_release_after_s: int | None = None
    release_when_done: bool | None = None
    release_after_s: int | None = None


@dataclass(frozen=True)
class PolicyView:
    """An instance's deadline rules (after `/gpu policy` or `/gpu cap`); times naive UTC, shown
    in ``tz_name``."""

    name: str
    deadline_at: datetime | None
    lifetime_cap_at: datetime | None
    at_deadline: str
    max_grace_s: int
    idle_release_after_s: int | None
    release_when_done: bool
    tz_name: str = "UTC"


def set_policy(rt: Runtime, caller: Caller, name: str, change: PolicyChange) -> PolicyView:
    """Change an instance's deadline policy, maximum grace, idle release or release-when-done.
    Owner or admin. Raises UsageError, NotFound, NotAuthorized, Conflict (not active)."""
    if change.at_deadline is not None and change.at_deadline not in POLICIES:
        raise UsageError(
            t("{policy!r} is not a deadline policy.", policy=change.at_deadline),
            hint=t("Use --at-deadline release, wait-for-jobs or stop."),
        )
    if change == PolicyChange():
        raise UsageError(
            t("Nothing to change."),
            hint=t(
                "Give --at-deadline, --max-grace, --release-after, --idle-release or "
                "--release-when-done."
            ),
        )
    if change.release_after_s is not None and change.release_after_s <= 0:
        raise UsageError(t("--release-after must be a positive duration."), hint=t("Like 24h."))
    now = rt.now()
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        access.require_owner_or_admin(rt, caller, inst, action="change the policy of")
        if inst.state == releases.STOPPED:
            return _keep_stopped(rt, session, caller, inst, change, now)
        if inst.state != "active":
            raise Conflict(
                t("{name} is being released; its policy can no longer change.", name=inst.name)
            )
        _check_stop_policy(rt, inst, change)
        before = _policy_of(inst)
        if change.at_deadline is not None:
            inst.deadline_policy = change.at_deadline
        if change.max_grace_s is not None:
            inst.max_grace_s = change.max_grace_s
        if change.release_after_s is not None:
            inst.max_grace_s = change.release_after_s
        if change.idle_release_after_s is not None:
            inst.idle_release_after_s = change.idle_release_after_s or None
        if change.release_when_done is not None:
            inst.release_when_done = change.release_when_done
        session.add(inst)
        audit.record(
            session,
            at=now,
            actor=caller.user_id,
            action="policy",
            instance_id=inst.id,
            before=before,
            after=_policy_of(inst),
        )
        session.flush()
        return policy_view(inst, rt.settings.timezone)


def _keep_stopped(
    rt: Runtime,
    session: Session,
    caller: Caller,
    inst: Instance,
    change: PolicyChange,
    now: datetime,
) -> PolicyView:
    """A stopped instance has one rule: when its kept disk is released, ``--release-after``
    counted from the stop (an admin's lifetime cap still applies). Raises UsageError for
    anything else."""
    if change.release_after_s is None or change != PolicyChange(
        release_after_s=change.release_after_s
    ):
        raise UsageError(
            t(
                "{name} is stopped: only when its disk is released can change, with "
                "--release-after (counted from the stop).",
                name=inst.name,
            ),
            hint=t("Like `/gpu policy {name} --release-after 3d`.", name=inst.name),
        )
    before = _policy_of(inst)
    stopped_at = inst.stopped_at or now
    release_at = max(stopped_at + timedelta(seconds=change.release_after_s), now)
    won = session.exec(
        update(Instance)
        .where(col(Instance.id) == inst.id, col(Instance.state) == releases.STOPPED)
        .values(deadline_at=release_at)
    ).rowcount
    if won != 1:
        raise Conflict(t("{name} changed meanwhile.", name=inst.name), hint=t("Try again."))
    session.refresh(inst)
    audit.record(
        session,
        at=now,
        actor=caller.user_id,
        action="policy",
        instance_id=inst.id,
        before=before,
        after={**_policy_of(inst), "deadline_at": release_at.isoformat()},
    )
    return policy_view(inst, rt.settings.timezone)


def _check_stop_policy(rt: Runtime, inst: Instance, change: PolicyChange) -> None:
    """Raise UsageError when the change asks for policy ``stop`` where it cannot be: a platform
    that cannot stop, no --release-after, or --release-after with another policy."""
    policy = change.at_deadline or inst.deadline_policy
    if policy != STOP_POLICY:
        if change.release_after_s is not None:
            raise UsageError(
                t("--release-after goes with --at-deadline stop."), hint=_stop_example(inst)
            )
        return
    if change.at_deadline == STOP_POLICY and inst.deadline_policy != STOP_POLICY:
        if change.release_after_s is None:
            raise UsageError(
                t("Say when the stopped instance is released: --release-after."),
                hint=_stop_example(inst),
            )
        if not rt.providers.get(inst.provider).capabilities.can_stop:
            raise UsageError(
                t(
                    "{name} runs on {provider}, which cannot stop an instance (only terminate "
                    "it), so it cannot be stopped at its deadline.",
                    name=inst.name,
                    provider=platform_name(inst.provider),
                ),
                hint=t("Use --at-deadline release or --at-deadline wait-for-jobs."),
            )


def _stop_example(inst: Instance) -> str:
    return t("`/gpu policy {name} --at-deadline stop --release-after 24h`.", name=inst.name)


def _ask_an_admin(rt: Runtime) -> str:
    admins = sorted(rt.settings.admins)
    if not admins:
        return t("No admin is configured: the bot's operator lists them in GPUBOT_ADMINS.")
    return t("Ask an admin: {admins}.", admins=", ".join(f"<@{a}>" for a in admins))


def set_lifetime_cap(
    rt: Runtime, caller: Caller, name: str, lifetime: timedelta | None
) -> PolicyView:
    """An admin sets the most an instance may live (counted from its registration), or lifts
    it (None). Owners cannot extend past it. Raises NotAuthorized for anyone but an admin,
    UsageError for a lifetime not positive or one that ends in the past (it names the time
    now)."""
    if not rt.settings.is_admin(caller.user_id):
        raise NotAuthorized(
            t("Only an admin can set or lift a maximum lifetime."), hint=_ask_an_admin(rt)
        )
    now = rt.now()
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        if inst.state != "active":
            raise Conflict(
                t("{name} is being released; its lifetime can no longer change.", name=inst.name)
            )
        old = inst.lifetime_cap_at
        if lifetime is not None:
            _require_future_cap(rt, inst, lifetime, now)
        inst.lifetime_cap_at = None if lifetime is None else inst.created_at + lifetime
        session.add(inst)
        audit.record(
            session,
            at=now,
            actor=caller.user_id,
            action="lifetime_cap",
            instance_id=inst.id,
            old_cap_at=old,
            new_cap_at=inst.lifetime_cap_at,
        )
        session.flush()
        return policy_view(inst, rt.settings.timezone)


def _require_future_cap(rt: Runtime, inst: Instance, lifetime: timedelta, now: datetime) -> None:
    """Raise UsageError unless ``lifetime`` is positive and, counted from the registration,
    ends after ``now``."""
    if lifetime <= timedelta(0):
        raise UsageError(
            t("A maximum lifetime must be positive."), hint=t("Like `/gpu cap NAME 3d`.")
        )
    lived = format_duration(now - inst.created_at)
    require_future(
        rt,
        inst.created_at + lifetime,
        now,
        t("The end of that lifetime"),
        t(
            "{name} has run {lived} already: give a longer lifetime, or release it with "
            "`/gpu release {name}`.",
            name=inst.name,
            lived=lived,
        ),
    )


def policy_view(inst: Instance, tz_name: str = "UTC") -> PolicyView:
    """An instance's deadline rules, its times to be shown in ``tz_name``."""
    return PolicyView(
        name=inst.name,
        deadline_at=inst.deadline_at,
        lifetime_cap_at=inst.lifetime_cap_at,
        at_deadline=inst.deadline_policy,
        max_grace_s=inst.max_grace_s,
        idle_release_after_s=inst.idle_release_after_s,
        release_when_done=inst.release_when_done,
        tz_name=tz_name,
    )


def _policy_of(inst: Instance) -> dict[str, object]:
    return {
        "at_deadline": inst.deadline_policy,
        "max_grace_s": inst.max_grace_s,
        "idle_release_after_s": inst.idle_release_after_s,
        "release_when_done": inst.release_when_done,
    }
