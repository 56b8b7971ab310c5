"""Changing an instance's life: extend its deadline, ask before a release, release (or stop) it,
and the owner's word that a manual instance is released on its platform.

Changes are the owner's or an admin's (bot.services.access) and audited in the transaction that
makes them; every network call (the platform's API) happens outside a transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import update
from sqlmodel import col

from bot.errors import AlreadyAnswered, Conflict, NotAuthorized, UsageError
from bot.i18n import N_, t
from bot.providers.base import check_mode
from bot.runtime import Runtime
from bot.services import access
from bot.services.access import Caller
from bot.services.instances import releases
from bot.services.instances.fleet_views import running_jobs
from bot.services.instances.lookup import (
    by_id,
    get_live_instance,
    instance_view,
    is_manual,
    require_active,
)
from bot.services.instances.views import InstanceView, ReleaseAsk, ReleaseView
from bot.services.money import budgets, costs
from bot.services.speaking import audit, prompts
from bot.store.models import Instance
from bot.values import duration_code, format_duration, format_when

#: What a refusal past the lifetime cap suggests, unless the caller says otherwise.
EARLIER_DEADLINE_HINT = N_("Choose an earlier deadline, or ask an admin to go past the limit.")


def _require_deadline_if_stopped(inst: Instance) -> None:
    """A stopped instance has no compute deadline to extend; one whose disk is kept with no
    release time has nothing to extend at all. Raises UsageError then."""
    if inst.state != releases.STOPPED or inst.deadline_at is not None:
        return
    raise UsageError(
        t(
            "{name} is stopped and has no deadline: its disk is kept (and billed) until it is "
            "released.",
            name=inst.name,
        ),
        hint=t(
            "`/gpu release {name}` terminates it; `/gpu policy {name} --release-after 3d` sets "
            "when; start it on its platform to use it again.",
            name=inst.name,
        ),
    )


def extend(
    rt: Runtime, caller: Caller, name: str, delta: timedelta, *, answering: int | None = None
) -> InstanceView:
    """Move the deadline ``delta`` later (from now when it passed or there is none). Owner or
    admin; only an admin goes past the lifetime cap or a used-up monthly budget.

    ``answering`` is the warning prompt whose button asked for it: it and its group are
    answered in the same transaction as the extension, so a double click extends once. The
    deadline moves only from the one read here (compare-and-set). A stopped instance keeps its
    state; a manual one awaiting its owner's release confirmation runs on, that release request
    withdrawn (bot.services.instances.releases.cancel_awaiting_release). Raises UsageError,
    NotFound,
    NotAuthorized, BudgetExceeded, AlreadyAnswered, Conflict (being released, or changed
    meanwhile).
    """
    if delta <= timedelta(0):
        raise UsageError(t("Extend by a positive duration."), hint=t("Like `/gpu extend NAME 2h`."))
    now = rt.now()
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        access.require_owner_or_admin(rt, caller, inst, action="extend")
        releases.require_extendable(rt, session, inst)
        owner_id, project = inst.owner_id, inst.project
    budgets.check_budget(rt, caller, owner_id, project)
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        access.require_owner_or_admin(rt, caller, inst, action="extend")
        releases.require_extendable(rt, session, inst)
        _require_deadline_if_stopped(inst)
        old = inst.deadline_at
        new = max(old or now, now) + delta
        cap = inst.lifetime_cap_at
        check_cap(
            rt,
            caller,
            inst,
            new,
            t("extending by {duration}", duration=format_duration(delta)),
            t("Extend by less, or ask an admin to extend it past the limit."),
        )
        if answering is not None and not prompts.resolve_group(
            session,
            answering,
            resolution=f"extended_{duration_code(delta)}",
            by=caller.user_id,
            now=now,
        ):
            raise AlreadyAnswered(
                t("The warning about {name} was already answered.", name=inst.name)
            )
        won = session.exec(
            update(Instance)
            .where(
                col(Instance.id) == inst.id,
                col(Instance.state) == inst.state,
                _same_deadline(old),
            )
            .values(deadline_at=new, state=releases.state_after_extend(inst.state))
        ).rowcount
        if won != 1:
            raise Conflict(
                t(
                    "{name} changed while it was being extended (released, or its deadline moved).",
                    name=inst.name,
                ),
                hint=t(
                    "`/gpu status {name}` shows it now; extend again if you still want to.",
                    name=inst.name,
                ),
            )
        audit.record(
            session,
            caller.user_id,
            "extend",
            inst.id,
            at=now,
            old_deadline_at=old,
            new_deadline_at=new,
            by_s=int(delta.total_seconds()),
            past_cap=bool(cap is not None and new > cap),
        )
        cancelled = releases.cancel_awaiting_release(session, inst, by=caller.user_id, now=now)
        session.refresh(inst)
        view = instance_view(inst)
    by_s = int(delta.total_seconds())
    brief = releases.instance_view(inst)
    releases.show_cancelled(rt, cancelled, brief, by=caller.user_id, extended_s=by_s)
    return view


def ask_release(rt: Runtime, caller: Caller, name: str, *, stop: bool = False) -> ReleaseAsk:
    """What releasing (or, with ``stop``, stopping) would mean: cost so far, running jobs, and
    for a stop what the disk goes on costing; changes nothing. Owner or admin. A stopped
    instance can be released (terminated), not stopped again.

    Raises NotFound, NotAuthorized, Conflict (being released, or already stopped),
    ProviderError (the platform cannot stop) and ConfigError (it is not configured)."""
    now = rt.now()
    with rt.db.session() as session:
        inst = get_live_instance(rt, session, name)
        access.require_owner_or_admin(rt, caller, inst, action="stop" if stop else "release")
        if inst.state != releases.STOPPED:
            require_active(inst, t("released again"))
        elif stop:
            raise Conflict(
                t("{name} is already stopped.", name=inst.name),
                hint=t("`/gpu release {name}` terminates it, disk and all.", name=inst.name),
            )
        jobs = running_jobs(session, [inst.id] if inst.id is not None else [])
    if stop:
        check_mode(rt.providers.get(inst.provider), "stop")
    return ReleaseAsk(
        instance=instance_view(inst),
        manual=is_manual(rt, inst),
        cost_micros=costs.since_registered_micros(inst, now),
        running_jobs=jobs.get(inst.id or 0, ()),
        mode="stop" if stop else "terminate",
    )


def release(
    rt: Runtime, caller: Caller, instance_id: int, *, mode: str = "terminate"
) -> ReleaseView:
    """The confirmed release (or stop), by the one route a prompt's button takes too
    (:func:`bot.services.instances.releases.release_now`): open a Release (reason ``user``) and
    work on it
    now. A platform with an API is asked to terminate (or stop); a manual one gets the owner
    asked to do it there. Raises NotFound, NotAuthorized, Conflict (already released, or already
    stopped), UsageError (a mode that is not one), ProviderError/ConfigError."""
    done = releases.release_now(rt, caller, instance_id, mode=mode)
    assert done.id is not None
    with rt.db.session() as session:
        current = by_id(rt, session, instance_id)
    return ReleaseView(
        instance=instance_view(current),
        release_id=done.id,
        state=done.state,
        manual=is_manual(rt, current),
        last_error=done.last_error,
        mode=done.mode,
        final_cost=costs.final_cost(current) if done.state == "confirmed" else None,
    )


def confirm_released(
    rt: Runtime, caller: Caller, instance_id: int, *, stopped: bool = False
) -> ReleaseView:
    """The owner (or an admin) says a manual instance is released on its platform, or only
    ``stopped`` there (its disk kept and billed): the meter stops now (for compute only when
    stopped). Idempotent. Raises NotFound, NotAuthorized, Conflict."""
    done = releases.confirm_manual_release(rt, caller, instance_id, stopped=stopped)
    with rt.db.session() as session:
        inst = by_id(rt, session, instance_id)
    rt.fleet.forget(inst.name)
    assert done.id is not None
    return ReleaseView(
        instance=instance_view(inst),
        release_id=done.id,
        state=done.state,
        manual=True,
        last_error=done.last_error,
        mode=done.mode,
        final_cost=costs.final_cost(inst) if done.state == "confirmed" else None,
    )


def require_future(rt: Runtime, at: datetime, now: datetime, what: str, hint: str) -> None:
    """Raise UsageError when ``at`` (naive UTC) is not after ``now``: ``what`` names the time
    given (like "The lifetime cap"), and the error shows both times in the workspace's timezone;
    ``hint`` says what to do instead. Both texts in the active language."""
    if at > now:
        return
    tz = ZoneInfo(rt.settings.timezone)
    raise UsageError(
        t(
            "{what} ({at}) is already past: it is now {now}.",
            what=what,
            at=format_when(at, tz),
            now=format_when(now, tz),
        ),
        hint=hint,
    )


def check_cap(
    rt: Runtime,
    caller: Caller,
    inst: Instance,
    new: datetime,
    doing: str,
    hint: str | None = None,
) -> None:
    """Raise NotAuthorized when moving the deadline to ``new`` (naive UTC) passes the lifetime
    cap an admin set, unless the caller is an admin; ``doing`` names the change and ``hint``
    (default :data:`EARLIER_DEADLINE_HINT`) says what to do instead, both in the active
    language."""
    cap = inst.lifetime_cap_at
    if cap is None or new <= cap or access.is_admin(rt, caller):
        return
    now = rt.now()
    if cap <= now:
        tz = ZoneInfo(rt.settings.timezone)
        raise NotAuthorized(
            t(
                "{name}'s maximum lifetime (a limit an admin set) ended at {cap}; it is now "
                "{now}, so only an admin can keep it running.",
                name=inst.name,
                cap=format_when(cap, tz),
                now=format_when(now, tz),
            ),
            hint=t("Ask an admin to lift or raise the limit with `/gpu cap`, or release it."),
        )
    raise NotAuthorized(
        t(
            "{name} may run until {cap} at most (a limit an admin set); {doing} would go past it.",
            name=inst.name,
            cap=format_when(cap, ZoneInfo(rt.settings.timezone)),
            doing=doing,
        ),
        hint=hint if hint is not None else t(EARLIER_DEADLINE_HINT),
    )


def _same_deadline(old: datetime | None) -> Any:
    """The clause "the deadline is still ``old``" (compare-and-set)."""
    if old is None:
        return col(Instance.deadline_at).is_(None)
    return col(Instance.deadline_at) == old
